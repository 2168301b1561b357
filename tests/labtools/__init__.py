"""labtools: the clients that load and watch a running fleet for the tests, the Molecule scenarios and the benchmarks
(never the product: nothing under roles/, plugins/ or src/ imports them). They use the library (vllm_fleet) and run
with both folders on the path: ``PYTHONPATH=src:tests python -m labtools.probe --help``.

- streamload: a bounded loop of streamed chat completions through the gateway (failed, cut, TTFT);
- probe: a bounded request loop against vLLM hosts during a rollout (failed requests, unhealthy windows);
- conversations: a multi-turn workload with shared prefixes, and the prefix cache's hit rate;
- failover: how long a shared address goes unanswered while it moves between gateways.
"""
