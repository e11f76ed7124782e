"""What the app, the CLI and exports show, computed apart from the model and from Streamlit: token views of a group or
a stored step (:mod:`.token_view`), tables (:mod:`.tables`), JSON (:mod:`.export`) and self-contained HTML
(:mod:`.render`: heatmaps, in :mod:`.style`'s colors; :mod:`.overview`: long responses overview first; :mod:`.page`:
the exported page; :mod:`.notes`: what the views say in words beside the numbers)."""
from mrtpo.display.export import view_to_json
from mrtpo.display.tables import faithfulness_table, group_table, relevance_change
from mrtpo.display.token_view import TokenView, group_credit, stored_step_view, token_view

__all__ = ["TokenView", "faithfulness_table", "group_credit", "group_table", "relevance_change", "stored_step_view",
           "token_view", "view_to_json"]
