"""lock_check: a randomized, fault-injecting workload and a checker of its history (Jepsen style)."""

from .checker import Violation, check_history
from .options import CheckOptions
from .report import CheckResult
from .run import run_check

__all__ = ["CheckOptions", "CheckResult", "Violation", "check_history", "run_check"]
