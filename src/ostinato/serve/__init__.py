"""``ostinato serve``: an OpenAI-compatible transcription server.

One engine per model owns the device (``services``); HTTP handlers only parse, validate, submit and
stream results back (``app``); responses are OpenAI's formats (``formats``); Prometheus metrics in
``metrics``. FastAPI and uvicorn come with ``pip install 'ostinato[server]'``.
"""
