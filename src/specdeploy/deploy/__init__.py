"""Deploy: a LaunchPlan to a running, health-checked, smoke-tested and recorded server, and back."""
