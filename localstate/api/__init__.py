"""The REST API and web UI of localstate's central DB (needs the ``api`` extra: fastapi,
uvicorn).

    from localstate.api import create_app
    app = create_app(settings)
"""

from localstate.api._app import create_app

__all__ = ["create_app"]
