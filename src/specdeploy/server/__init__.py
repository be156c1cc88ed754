"""The reference engine's HTTP server: SGLang's routes and field names over the batching engine."""
