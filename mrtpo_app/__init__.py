"""The Streamlit app's helpers (the app itself is ``app.py`` and ``pages/`` at the top of the repository): page set-up
and sidebar (:mod:`.sidebar`), the model and the caches (:mod:`.models`, :mod:`.caches`, :mod:`.timer`), the session
(:mod:`.state`), messages and shared widgets (:mod:`.ui`), and the parts of the larger pages (:mod:`.explore`,
:mod:`.sampling`, :mod:`.train_page`, :mod:`.run_viewer`, :mod:`.charts`, :mod:`.topk_chart`).  The library
(``mrtpo``) never imports Streamlit; this package is where the app's glue lives.

The links ``app.py``, ``pages`` and ``.streamlit`` here point at the top-level files: they are how a wheel ships the
one app inside this package (``mrtpo app`` runs it from an installed wheel); the app lives only at the top.
"""
