"""The Jinja2 environment every server-rendered page of the project uses: templates from the
packages that hold them, autoescape always on (a value put into a page is text unless a template
says otherwise with ``Markup``: one forgotten call can no longer inject script into a page that
holds the donor's token), and a missing name is an error, not an empty string."""

from __future__ import annotations

from functools import cache

import jinja2
from markupsafe import Markup


@cache
def environment(*packages: str) -> jinja2.Environment:
    """An environment whose templates come from ``templates/`` of each of ``packages`` (first
    match wins) and then from ``volunteer.web``'s own (the shared macros and the SVG plots)."""
    loaders = [jinja2.PackageLoader(package, "templates") for package in (*packages, "volunteer.web")]
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env


def render(template: str, *packages: str, **context: object) -> Markup:
    """``template`` rendered with ``context``; Markup, so that a page can place it unescaped."""
    return Markup(environment(*packages).get_template(template).render(**context))


__all__ = ["Markup", "environment", "render"]
