"""Memory estimators and the capacity planner (`zerostream estimate`).

- DeepSpeed's ZeRO model-states estimators, same names, signatures and results
  (zero_estimators.py): estimate_zero2_model_states_mem_needs(_all_live, _all_cold),
  estimate_zero3_model_states_mem_needs(_all_live, _all_cold), model_to_params.
- The planner: a model (model.py: Hugging Face config or a parameter count) on a machine
  (machine.py: memories, link rates and where each rate came from), every ZeRO option's
  memory per GPU, host and NVMe and a lower bound on its step time (plan.py, each
  allocation sized as the runtime sizes it: sizing.py), the tiered placements it adds and
  the option it recommends (tiers.py), why, written as a ds_config.json (recommend.py); the
  command in cli.py. What measures a run to check the planner is bench/'s (validate.py,
  cluster_check.py).
"""

from .cli import add_arguments, add_parser, main, plan, run
from .machine import Machine, Rate, build_machine, load_measurements
from .model import ModelShape, assumed_shape, from_hf_config, load_hf_config
from .plan import OPTIONS, Knobs, Option, Prediction, Workload, auto_knobs, predict
from .recommend import ds_config, explain
from .tiers import best
from .zero_estimators import (
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_cold,
    estimate_zero2_model_states_mem_needs_all_live,
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
    model_to_params,
)

__all__ = [
    "OPTIONS",
    "Knobs",
    "Machine",
    "ModelShape",
    "Option",
    "Prediction",
    "Rate",
    "Workload",
    "add_arguments",
    "add_parser",
    "assumed_shape",
    "auto_knobs",
    "best",
    "build_machine",
    "ds_config",
    "estimate_zero2_model_states_mem_needs",
    "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero2_model_states_mem_needs_all_live",
    "estimate_zero3_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live",
    "explain",
    "from_hf_config",
    "load_hf_config",
    "load_measurements",
    "main",
    "model_to_params",
    "plan",
    "predict",
    "run",
]
