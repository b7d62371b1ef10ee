"""Pieces every server-rendered page of the project shares: the base style sheet, the response
headers that keep a page to itself (CSP, no framing, no sniffing). The markup itself is in
``templates/`` (``macros.html`` holds the shared table), rendered through ``templating``."""

from __future__ import annotations

BASE_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#263238;color:#fff;padding:10px 20px;font-size:18px}
main{padding:12px 20px;max-width:1500px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:10px 0}
h2{font-size:16px;margin:4px 0 8px}h3{font-size:14px;margin:8px 0 4px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}.grid section{margin:0}
.badge{color:#fff;padding:3px 10px;border-radius:10px;font-weight:bold;text-transform:uppercase}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px 2px 0;text-align:left}
table.kv th{color:#555;font-weight:normal}.muted,.empty{color:#777}
ul{margin:4px 0;padding-left:20px;font-size:13px}li.warning{color:#b26a00}li.error{color:#b00020}
"""

# script only from the page's own origin, styles inline, nothing framed, no foreign fetches
PAGE_HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY", "x-content-type-options": "nosniff",
    # not no-referrer: with it, browsers send "Origin: null" on the page's own form posts
    "referrer-policy": "same-origin",
}


__all__ = ["BASE_STYLE", "PAGE_HEADERS"]
