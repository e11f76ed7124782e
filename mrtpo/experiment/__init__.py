"""Paired, seeded comparisons of methods: does one estimator learn faster than another?  Running and reading the runs
(:mod:`.run`), the statistics (:mod:`mrtpo.core.stats`), the outputs (:mod:`.report`)."""
from mrtpo.experiment.arms import FIXED_FIELDS
from mrtpo.experiment.report import (
    HTML_FILE,
    PNG_FILE,
    SUMMARY_FILE,
    band_polygons,
    plot_png,
    report_html,
    write_outputs,
)
from mrtpo.experiment.run import (
    MAX_SEEDS,
    PER_RUN_FIELDS,
    ExperimentConfig,
    ExperimentData,
    arm_label,
    experiment_summary,
    load_experiment,
    parse_arm,
    prepare,
    read_experiment,
    run_experiment,
)

__all__ = ["FIXED_FIELDS", "HTML_FILE", "MAX_SEEDS", "PER_RUN_FIELDS", "PNG_FILE", "SUMMARY_FILE", "ExperimentConfig",
           "ExperimentData", "arm_label", "band_polygons", "experiment_summary", "load_experiment", "parse_arm",
           "plot_png", "prepare", "read_experiment", "report_html", "run_experiment", "write_outputs"]
