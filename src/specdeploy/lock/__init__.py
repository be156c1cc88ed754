"""`specdeploy lock`: resolve a recipe's checkpoints, image and DDTree build to exact, re-fetchable pins."""
