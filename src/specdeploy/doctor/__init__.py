"""`specdeploy doctor`: static checks of a target/drafter pair and a short acceptance probe, as ranked findings."""
