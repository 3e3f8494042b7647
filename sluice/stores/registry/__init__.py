"""The model registry: models, their versions, the replicas serving them and each model's route, with one
generation number and an audit log. PostgreSQL in production, SQLite embedded (see README.md)."""
