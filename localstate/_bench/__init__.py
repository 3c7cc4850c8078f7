"""The write-throughput benchmark behind `localstate bench` and `benches/`."""

from localstate._bench.report import print_table, run_bench, summary, write_json, write_plot
from localstate._bench.runner import STORE_MODES, BenchConfig, BenchRow, run_scenario

__all__ = [
    "STORE_MODES",
    "BenchConfig",
    "BenchRow",
    "print_table",
    "run_bench",
    "run_scenario",
    "summary",
    "write_json",
    "write_plot",
]
