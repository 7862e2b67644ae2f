#!/usr/bin/env python3
"""Renders chat templates as Hugging Face transformers' apply_chat_template renders them (jinja2's
sandboxed environment with trim_blocks and lstrip_blocks, loop controls, the generation block,
a tojson that keeps non-ASCII text, raise_exception and strftime_now; tools and documents none),
the reference for Parley's template tests.

Input on stdin, JSON: {"bos": str, "eos": str, "jobs": [{"template": str, "messages": [...]}]}.
Output on stdout, JSON: one {"out": str} or {"raise": str} or {"error": str} per job."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)

req = json.load(sys.stdin)
res = []
for job in req["jobs"]:
    try:
        tpl = env.from_string(job["template"])
        res.append({"out": tpl.render(messages=job["messages"], add_generation_prompt=True, bos_token=req["bos"],
                                      eos_token=req["eos"], tools=None, documents=None)})
    except Raised as e:
        res.append({"raise": str(e)})
    except Exception as e:  # noqa: BLE001 - every failure is a result to compare
        res.append({"error": f"{type(e).__name__}: {e}"})
json.dump(res, sys.stdout)
