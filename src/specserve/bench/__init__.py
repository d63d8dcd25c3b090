"""The benchmark: every speculative configuration against the target alone, on the same prompts.

workloads.py loads the prompts, runner.py runs the configurations interleaved,
endpoint.py measures OpenAI-compatible servers, report.py turns runs into paired
speedups and a recommendation, table.py and plot.py show them. `specserve bench`
(cli/bench.py) wires them together.
"""
from .report import recommend, summarize, summarize_turns
from .runner import BenchConfig, BenchPlan, LocalModels, Measurement, plan_configs, run_benchmark
from .workloads import BUILTIN_WORKLOADS, BenchPrompt, load_workload

__all__ = ["BUILTIN_WORKLOADS", "BenchConfig", "BenchPlan", "BenchPrompt", "LocalModels", "Measurement",
           "load_workload", "plan_configs", "recommend", "run_benchmark", "summarize", "summarize_turns"]
