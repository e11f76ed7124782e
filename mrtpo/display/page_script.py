"""The exported page's one inline script (no CDN, no other file): on a click of a hottest span or an "open in full"
button (``.open`` with ``data-g``, ``data-r``, ``data-k`` and, for a span, ``data-c``), draw that response × reward in
full into its box from the page's JSON (:func:`mrtpo.display.page.response_data`), as
:func:`mrtpo.display.overview.full_html` draws it: the same cells (a character's tokens drawn once, advantages summed,
ρ averaged), colors (:func:`mrtpo.display.render.diverging_color` / ``sequential_color``), tooltips in ``data-tip``
(the CSS rule shows them), evidence underline and numbered hottest spans; then scroll to the clicked span.  It
also shows every ``data-tip`` in one floating tooltip kept inside the window (the CSS tooltip, which a cell near the
window's right edge pushes out of it, steps aside).
"""

SCRIPT = r"""
(function () {
  "use strict";
  var POS = [33, 102, 172], NEG = [178, 24, 43], REL = [230, 97, 1], cache = {};
  function data(g) {
    if (!(g in cache)) cache[g] = JSON.parse(document.getElementById("mrtpo-data-" + g).textContent);
    return cache[g];
  }
  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")
      .replace(/'/g, "&#x27;");
  }
  function tokText(s) {
    var e = esc(s);
    return e.indexOf("\n") >= 0 ? e.replace(/\n/g, '<span class="nl">\u21b5</span><br>') : e;
  }
  function repr(s) {  // Python's repr of a str (the tooltips' token text)
    var q = (s.indexOf("'") >= 0 && s.indexOf('"') < 0) ? '"' : "'", out = q;
    for (var n = 0; n < s.length; n++) {
      var c = s[n], code = s.charCodeAt(n);
      if (c === "\\") out += "\\\\";
      else if (c === q) out += "\\" + q;
      else if (c === "\n") out += "\\n";
      else if (c === "\r") out += "\\r";
      else if (c === "\t") out += "\\t";
      else if (code < 32 || code === 127) out += "\\x" + ("0" + code.toString(16)).slice(-2);
      else out += c;
    }
    return out + q;
  }
  function val(x) { return x === null || x === undefined ? NaN : x; }
  function fix(x, d) { return isNaN(x) ? "nan" : x.toFixed(d); }
  function sgn(x, d) { return isNaN(x) ? "+nan" : (x >= 0 ? "+" : "") + x.toFixed(d); }
  function g4(x) {  // Python's format(x, ".4g")
    if (isNaN(x)) return "nan";
    if (x === 0) return "0";
    var ex = x.toExponential(3), p = ex.split("e"), e = parseInt(p[1], 10);
    if (e < -4 || e >= 4) {
      var m = p[0].indexOf(".") >= 0 ? p[0].replace(/0+$/, "").replace(/\.$/, "") : p[0];
      var d = String(Math.abs(e));
      return m + "e" + (e < 0 ? "-" : "+") + (d.length < 2 ? "0" + d : d);
    }
    var f = x.toFixed(Math.max(0, 3 - e));
    return f.indexOf(".") >= 0 ? f.replace(/0+$/, "").replace(/\.$/, "") : f;
  }
  function rgba(c, a) { return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + a.toFixed(3) + ")"; }
  function diverging(v, vmax) {
    if (vmax <= 0 || v === 0 || !isFinite(v)) return "transparent";
    return rgba(v > 0 ? POS : NEG, Math.min(1, Math.abs(v) / vmax) * 0.85);
  }
  function sequential(v, vmax) {
    if (vmax <= 0 || !(v > 0) || !isFinite(v)) return "transparent";
    return rgba(REL, Math.min(1, v / vmax) * 0.85);
  }
  function cells(R) {  // lists of token indices (mrtpo.core.spans.cells)
    var out = [], t = 0, n = R.n || R.text.map(function () { return 1; });
    n.forEach(function (k) { var c = []; for (var u = 0; u < k; u++) c.push(t++); out.push(c); });
    return out;
  }
  function row(R, label, note, vals, kind, vmax, tips, marks, hot) {
    var color = kind === "diverging" ? diverging : sequential, agg = kind === "diverging" ? "sum" : "mean";
    var cs = cells(R), mark = new Array(R.text.length).fill(false), inHot = [], rank = {}, out = [];
    (marks || []).forEach(function (r) { for (var t = r[0]; t < r[1]; t++) mark[t] = true; });
    (hot || []).forEach(function (h, n) { rank[h[0]] = n + 1; for (var c = h[0]; c < h[1]; c++) inHot[c] = true; });
    var cm = cs.map(function (g) { return g.some(function (t) { return mark[t]; }); });
    cs.forEach(function (g, n) {
      var v = 0, text = "";
      g.forEach(function (t) { v += val(vals[t]); text += R.text[t]; });
      if (agg === "mean") v /= g.length;
      if (cm[n] && (n === 0 || !cm[n - 1])) out.push('<span class="ev">');
      if (rank[n]) out.push('<b class="rk" data-c="' + n + '">' + rank[n] + "</b>");
      var tip = tips(g[0]);
      if (g.length > 1) {
        tip = repr(text) + ": " + g.length + " tokens sharing a character, drawn as their " + agg + " " + g4(v);
        g.forEach(function (t, k) { tip += "\ntoken " + (k + 1) + "/" + g.length + ": " + tips(t); });
      }
      if (cm[n]) tip += " | evidence: read by the checker";
      out.push('<span class="tok' + (inHot[n] ? " hot" : "") + '" style="background:' + color(v, vmax) +
               '" data-i="' + g[0] + '" data-tip="' + esc(tip) + '">' + tokText(text) + "</span>");
      if (cm[n] && (n === cs.length - 1 || !cm[n + 1])) out.push("</span>");
    });
    var lab = esc(label) + (note ? '<span class="faith">' + esc(note) + "</span>" : "");
    return '<div class="row"><div class="lab">' + lab + '</div><div class="toks">' + out.join("") + "</div></div>";
  }
  function full(R, k) {
    var lim = R.lim, parts = [];
    if (k === "combined") {
      var comb = R.comb.map(val), fin = val(R.final);
      parts.push('<div class="reward"><b>combined</b> (sum over rewards, batch-normalized)</div>');
      parts.push('<div class="uni">' + R.base + " (uniform) " + R.chip + " on every token</div>");
      parts.push(row(R, R.label, "", comb, "diverging", lim[0], function (t) {
        return repr(R.text[t]) + " | combined | " + R.method + " advantage " + sgn(comb[t], 4) + " | " + R.base +
          " advantage " + sgn(fin, 4);
      }));
      return '<div class="mrtpo full">' + R.legend + parts.join("") + "</div>";
    }
    var w = R.rewards[k];
    if (w.skipped) return '<div class="mrtpo full">' + w.head + "</div>";
    var a = w.a.map(val), rho = w.rho.map(val), js = w.js === null ? null : w.js.map(val), uni = val(w.uni);
    var moved = a.map(function (x) { return x - uni; });
    var tips = function (t) {
      var d = js === null ? " | JS not computed" : (isNaN(js[t]) ? "" : " | JS " + fix(js[t], 4));
      return repr(R.text[t]) + " | reward " + k + d + " | relevance " +
        fix(rho[t], 3) + " | " +
        R.method + " advantage " + sgn(a[t], 4) + " | " + R.base + " advantage " + sgn(uni, 4) + " | moved " +
        sgn(moved[t], 4);
    };
    parts.push(w.head);
    parts.push('<div class="uni">' + R.base + " (uniform) " + w.chip + " on every token (\u00c2_ik / scale: one " +
               "number for the whole response)</div>");
    parts.push(row(R, R.label, "", a, "diverging", lim[0], tips, w.ev, w.hot));
    if (R.tokens) parts.push(row(R, R.moved_label, "", moved, "diverging", lim[1], tips, w.ev, w.hot));
    parts.push(row(R, R.rel_label, w.note, rho, "sequential", lim[2], tips, w.ev, w.hot));
    if (w.oracle) {
      var o = w.oracle.map(val);
      parts.push(row(R, "evidence (oracle) \u03c1", w.onote, o, "sequential", lim[2], function (t) {
        return repr(R.text[t]) + " | reward " + k + " | oracle relevance " + fix(o[t], 3) + " (the checker read it: " +
          (o[t] > 1 ? "yes" : "no") + ")";
      }, null, w.hot));
    }
    return '<div class="mrtpo full">' + R.legend + parts.join("") + "</div>";
  }
  var tip = document.createElement("div");  // the one tooltip: the hovered cell's data-tip, kept in the window
  tip.className = "mrtpo-tip";
  document.documentElement.classList.add("mrtpo-js");  // (the CSS tooltip steps aside)
  document.addEventListener("mouseover", function (e) {
    var el = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!el) { tip.style.display = "none"; return; }
    if (!tip.parentNode) document.body.appendChild(tip);
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    var r = el.getBoundingClientRect(), w = tip.offsetWidth, h = tip.offsetHeight;
    var x = Math.max(4, Math.min(r.left, window.innerWidth - w - 8));
    var y = r.bottom + h + 8 > window.innerHeight ? r.top - h - 4 : r.bottom + 4;
    tip.style.left = x + "px";
    tip.style.top = Math.max(4, y) + "px";
  });
  document.addEventListener("click", function (e) {
    var el = e.target.closest ? e.target.closest(".open, .close") : null;
    if (!el) return;
    var box = el.classList.contains("close") ? el.closest(".fullbox") : null;
    if (box) { box.innerHTML = ""; return; }
    var g = el.getAttribute("data-g"), i = el.getAttribute("data-r"), k = el.getAttribute("data-k");
    box = document.getElementById("full-" + g + "-" + i);
    var R = data(g)[i];
    box.innerHTML = '<div class="fullhead">Response ' + esc(i) + " \u00d7 " + esc(k) + " in full " +
      '<button class="close">close</button></div>' + full(R, k);
    var c = el.getAttribute("data-c"), target = c === null ? box : box.querySelector('b.rk[data-c="' + c + '"]');
    (target || box).scrollIntoView({block: c === null ? "start" : "center"});
    if (target && target !== box) {
      target.classList.add("flash");
    }
  });
})();
"""
