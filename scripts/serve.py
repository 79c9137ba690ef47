"""Serves a folder on 127.0.0.1 with the MIME types the page needs.

The standard module maps .cjs to nothing (application/octet-stream) and, on some Python
versions, .js to a legacy type; module scripts need a JavaScript type. Every response says
Cache-Control: no-cache, so that a reload after scripts/build revalidates each file: without
it a browser may keep the old build's modules (heuristic freshness from Last-Modified) beside
the new glue.
"""
import functools
import http.server
import sys

folder, port = sys.argv[1], int(sys.argv[2])


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".cjs": "text/javascript",
        ".json": "application/json",
        ".svg": "image/svg+xml",
    }

    def end_headers(self):
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(Handler, directory=folder))
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
