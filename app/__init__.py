"""The blockpool service: FastAPI + uvicorn around one engine that owns the pool."""
