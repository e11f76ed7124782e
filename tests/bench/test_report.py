"""bench/report.py: the benchmark scripts write their figures into marked sections of docs/benchmarks.md."""
import datetime

import pytest

from bench import report

DOC = """# Benchmarks

Prose before.

<!-- bench:replay -->
| old | table |
|---|---|
<!-- /bench:replay -->

Prose between, kept as it is.

<!-- bench:app -->
app figures
<!-- /bench:app -->
"""


def test_replace_a_present_section_keeps_everything_else():
    new = report.replace_section(DOC, "replay", "| new | table |\n|---|---|\n| 1 | 2 |\n\n")
    assert new == DOC.replace("| old | table |\n|---|---|", "| new | table |\n|---|---|\n| 1 | 2 |")
    assert report.replace_section(new, "replay", "| old | table |\n|---|---|") == DOC  # and back


def test_an_absent_section_is_added_at_the_end():
    assert report.replace_section(DOC, "train", "step ratio 0.97") == (
        DOC + "\n<!-- bench:train -->\nstep ratio 0.97\n<!-- /bench:train -->\n")
    assert report.replace_section("", "train", "x") == "<!-- bench:train -->\nx\n<!-- /bench:train -->\n"
    assert report.replace_section("# T\n\n\n", "a", "x") == "# T\n\n<!-- bench:a -->\nx\n<!-- /bench:a -->\n"


@pytest.mark.parametrize("doc, problem", [
    ("<!-- bench:x -->\nno end\n", "expected one <!-- bench:x --> and one <!-- /bench:x -->, found 1 and 0"),
    ("no start\n<!-- /bench:x -->\n", "expected one <!-- bench:x --> and one <!-- /bench:x -->, found 0 and 1"),
    ("<!-- bench:x -->\n<!-- /bench:x -->\n<!-- bench:x -->\n<!-- /bench:x -->\n",
     "expected one <!-- bench:x --> and one <!-- /bench:x -->, found 2 and 2"),
    ("<!-- /bench:x -->\n<!-- bench:x -->\n", "<!-- /bench:x --> comes before <!-- bench:x -->"),
])
def test_bad_markers_are_refused(doc, problem):
    with pytest.raises(ValueError) as e:
        report.replace_section(doc, "x", "figures")
    assert str(e.value) == f"section 'x': {problem}"


def test_a_section_name_is_not_another_ones_prefix():
    doc = "<!-- bench:app -->\na\n<!-- /bench:app -->\n"
    added = "\n<!-- bench:app-cold -->\nb\n<!-- /bench:app-cold -->\n"
    assert report.replace_section(doc, "app-cold", "b") == doc + added


@pytest.mark.parametrize("name", ["", "Replay", "a b", "x-->", "-x"])
def test_bad_section_names(name):
    with pytest.raises(ValueError, match="bad section name"):
        report.markers(name)


def test_update_section_writes_the_file_atomically(tmp_path):
    p = tmp_path / "benchmarks.md"
    p.write_text(DOC, encoding="utf-8")
    p.chmod(0o664)
    assert report.update_section("app", "new app figures", p) == p
    assert p.read_text(encoding="utf-8") == DOC.replace("app figures", "new app figures")
    assert p.stat().st_mode & 0o777 == 0o664
    with pytest.raises(ValueError):  # a malformed document is left as it was
        report.update_section("broken", "x", _write(tmp_path / "bad.md", "<!-- bench:broken -->\n"))
    assert (tmp_path / "bad.md").read_text(encoding="utf-8") == "<!-- bench:broken -->\n"
    new = tmp_path / "new.md"  # no document yet: it is created
    report.update_section("replay", "t", new)
    assert new.read_text(encoding="utf-8") == "<!-- bench:replay -->\nt\n<!-- /bench:replay -->\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.md", "benchmarks.md", "new.md"]  # no temp file


def test_update_section_failure_leaves_the_old_file(tmp_path, monkeypatch):
    p = _write(tmp_path / "benchmarks.md", DOC)

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "replace", fail)
    with pytest.raises(OSError):
        report.update_section("app", "x", p)
    assert p.read_text(encoding="utf-8") == DOC and [x.name for x in tmp_path.iterdir()] == ["benchmarks.md"]


def _write(p, text):
    p.write_text(text, encoding="utf-8")
    return p


# ---------------------------------------------------------------------------------------------- the CPU
@pytest.mark.parametrize("flags, kind", [
    ("fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AMX-BF16"),
    ("avx2 avx512f avx512_bf16", "AVX512-BF16"),
    ("avx2 avx512f", "AVX-512"),
    ("sse4_2 avx avx2 fma", "AVX2"),
    ("sse4_2 avx", "no AVX2"),
    ("avx2x", "no AVX2"),  # whole flags only
])
def test_kind_of(flags, kind):
    assert report.kind_of(flags.split()) == kind


def test_cpu_kind_reads_cpuinfo(tmp_path):
    intel = tmp_path / "intel"
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
                     "flags\t\t: fpu avx2 avx512f amx_bf16\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n"
                     "flags\t\t: fpu\n", encoding="utf-8")
    assert report.cpu_kind(intel) == "Intel AMX-BF16"  # the first processor's fields
    amd = tmp_path / "amd"
    amd.write_text("vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx avx2\n", encoding="utf-8")
    assert report.cpu_kind(amd) == "AMD AVX2"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd\n", encoding="utf-8")
    assert report.cpu_kind(arm) == "unknown CPU (no AVX2)"
    assert report.cpu_kind(tmp_path / "missing") == "unknown CPU"


def test_stamp_table_and_section():
    day = datetime.date(2026, 12, 3)
    assert report.stamp(2, day, "Intel AMX-BF16") == "measured 2026-12-03 on Intel AMX-BF16, 2 threads"
    assert report.stamp(1, day, "AMD AVX2") == "measured 2026-12-03 on AMD AVX2, 1 thread"
    assert report.table(["a", "b|c"], [[1, "x|y"], ["", 2.5]]) == (
        "| a | b\\|c |\n|---|---|\n| 1 | x\\|y |\n|  | 2.5 |")
    s = report.section("bench/replay.py", "\n| a |\n|---|\n", threads=2)
    assert s.startswith("*measured ") and s.endswith(", 2 threads; written by `bench/replay.py`.*\n\n| a |\n|---|")


@pytest.mark.parametrize("fast, chosen", [(True, "bfloat16 weight copies (sampling: the own decoding step)"),
                                          (False, "float32 (sampling: the own decoding step; other models few-rows "
                                                   "products)")])
def test_machine_says_the_cpu_threads_and_the_precision_auto_picks(monkeypatch, fast, chosen):
    from mrtpo.model import decoder

    monkeypatch.setattr(decoder, "fast_bf16_cpu", lambda: fast)
    monkeypatch.setattr(report, "cpu_kind", lambda: "AMD AVX2")
    line = report.machine(threads=2)
    assert line.startswith("machine: measured ") and "on AMD AVX2, 2 threads" in line
    assert line.endswith(f"precision auto → {chosen} on the CPU")
