#!/usr/bin/env python3
"""Streamed completions in flight while a unit restarts: did each finish, or was it cut?

    drain.py URL MODEL STREAMS MAX_TOKENS OUT.json

Opens STREAMS concurrent streamed /v1/completions (ignore_eos, so each wants MAX_TOKENS tokens) and
writes, per stream, the tokens received, the finish reason (None when cut) and the error. Stdlib only.
"""

import json
import sys
import threading
import time
import urllib.request


def stream(url, model, max_tokens, rec):
    body = json.dumps(
        {
            "model": model,
            "prompt": "t5 t6 t7 t8",
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    rec.update(tokens=0, finish_reason=None, error=None, t_start=time.time())
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                rec["tokens"] += 1
                rec["finish_reason"] = choice.get("finish_reason") or rec["finish_reason"]
    except Exception as exc:  # noqa: BLE001 - a cut stream is the finding, not a failure of this script
        rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
    rec["t_end"] = time.time()


def main(url, model, streams, max_tokens, out):
    recs = [{} for _ in range(int(streams))]
    threads = [threading.Thread(target=stream, args=(url, model, int(max_tokens), r)) for r in recs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = sum(1 for r in recs if r.get("finish_reason") == "length")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"streams": recs, "finished": done, "wanted_tokens": int(max_tokens)}, f, indent=1)
    print(f"{done} of {streams} streams finished ({[r.get('tokens') for r in recs]} tokens)")


if __name__ == "__main__":
    main(*sys.argv[1:6])
