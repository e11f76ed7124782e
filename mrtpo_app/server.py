"""``python -m mrtpo_app.server <streamlit arguments>``: Streamlit's ``streamlit <arguments>`` in this process, the
models in a process of their own (:func:`mrtpo_app.models.use_process`), the sidebar's default model loading there
from before the server starts (:func:`mrtpo_app.models.preload_model`): its imports and load run beside the server's
start and first page, and the first click finds the model loaded, or nearly. ``mrtpo app`` starts the app this way;
a plain ``streamlit run app.py`` keeps its models in its own process and starts that load at the first page (a
script has no server-start hook)."""
from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    """The model's process and its load, then Streamlit's command line with ``args`` (``run app.py --server.port
    …``)."""
    from mrtpo_app.model_load import default_model_name
    from mrtpo_app.model_process import use_process

    use_process().preload(default_model_name(), "auto")  # the worker starts before Streamlit's import

    from streamlit.web import cli as streamlit_cli

    return streamlit_cli.main(args=args, prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
