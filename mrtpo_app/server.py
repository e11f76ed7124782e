"""``python -m mrtpo_app.server <streamlit arguments>``: Streamlit's ``streamlit <arguments>`` in this process, the
sidebar's default model loading in a background thread from before the server starts
(:func:`mrtpo_app.models.preload_model`): the first page finds torch imported and the model loaded, or nearly.
``mrtpo app`` starts the app this way; a plain ``streamlit run app.py`` starts that load at the first page instead
(a script has no server-start hook)."""
from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    """The model's background load, then Streamlit's command line with ``args`` (``run app.py --server.port …``)."""
    from streamlit.web import cli as streamlit_cli

    from mrtpo_app.models import default_model_name, preload_model

    preload_model(default_model_name())
    return streamlit_cli.main(args=args, prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
