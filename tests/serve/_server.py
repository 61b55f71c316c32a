"""`serving(...)`: a server app on a real uvicorn server on an ephemeral loopback port, in a thread, for tests."""
import contextlib
import socket
import threading
import time


class Running:
    def __init__(self, app, url):
        self.app, self.url = app, url
        self.state = app.state.fastenc

    def client(self, **kw):
        import httpx
        return httpx.Client(base_url=self.url, timeout=60, **kw)


@contextlib.contextmanager
def serving(model_dir=None, *, ready_timeout: float = 600, **limits):
    """The app of model_dir on 127.0.0.1:<free port> until the block ends (then shut down, bounded)."""
    import httpx
    import uvicorn

    from fastenc.serve import create_app

    app = create_app(model_dir, **limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            try:
                r = httpx.get(url + "/health", timeout=5)
                if r.status_code == 200:
                    break
                if app.state.fastenc.error:
                    raise RuntimeError(app.state.fastenc.error)
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server at {url} was not ready in {ready_timeout} s")
            time.sleep(0.05)
        yield Running(app, url)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
