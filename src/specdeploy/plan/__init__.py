"""Plans: a pure function from (recipe, hardware, mode, overrides) to a LaunchPlan, and its renderings."""

from specdeploy.modes import MODES
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.make import make_plan

__all__ = ["MODES", "LaunchPlan", "make_plan"]
