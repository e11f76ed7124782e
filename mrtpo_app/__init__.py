"""The Streamlit app's helpers (the app itself is ``app.py`` and ``pages/`` at the top of the repository): page set-up
and sidebar (:mod:`.sidebar`), session state and caches (:mod:`.state`), messages (:mod:`.ui`), and the parts of the
larger pages (:mod:`.explore`, :mod:`.training`, :mod:`.charts`, :mod:`.topk`).  The library (``mrtpo``) never
imports Streamlit; this package is where the app's glue lives.

In a wheel, ``app.py``, ``pages/`` and ``.streamlit/`` are shipped inside this package (links here point at the
top-level files), so that ``mrtpo app`` runs the same app from an installed package.
"""
