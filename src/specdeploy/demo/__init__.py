"""`specdeploy demo`: the product's flow on a shipped zoo pair, on this machine's CPU."""
