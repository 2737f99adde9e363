"""The shared core of both sifting front-ends (see :mod:`hasten.sifting` for the story).

- :mod:`~hasten.sifting.core.rules`: the one registry of rules (name -> config -> policy, and the
  front-ends that run each);
- :mod:`~hasten.sifting.core.fields`: the field validation every config uses;
- :mod:`~hasten.sifting.core.dist`: "is torch.distributed active, which rank", and the
  collectives sifting needs;
- :mod:`~hasten.sifting.core.length`: the length rule (batches a data pass yields at a keep rate);
- :mod:`~hasten.sifting.core.epochs`: how data passes become a trainer's epochs (pass streams,
  fixed-length epochs, the length plan, the pruned pass), for the loader and every adapter;
- :mod:`~hasten.sifting.core.forward`: the scoring forward (eval mode, restored) and the
  per-sample loss check;
- :mod:`~hasten.sifting.core.state`: state dicts derived from dataclasses.

Nothing is imported here: each module is imported by name. The layers run one way: the
registry imports only ``fields`` and the exceptions; the policies import the registry, and the
config modules import both and register their rules.
"""

__all__: list[str] = []
