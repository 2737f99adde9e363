"""The shared core of both sifting front-ends (see :mod:`hasten.sifting` for the story).

- :mod:`~hasten.sifting.core.rules`: the one registry of rules (name -> config -> policy, and the
  front-ends that run each);
- :mod:`~hasten.sifting.core.fields`: the field validation every config uses;
- :mod:`~hasten.sifting.core.dist`: "is torch.distributed active, which rank", and the
  collectives sifting needs;
- :mod:`~hasten.sifting.core.length`: the length rule (batches a data pass yields at a keep rate);
- :mod:`~hasten.sifting.core.forward`: the scoring forward (eval mode, restored) and the
  per-sample loss check;
- :mod:`~hasten.sifting.core.state`: state dicts derived from dataclasses.

Nothing is imported here, so that the config modules can use :mod:`~hasten.sifting.core.fields`
while the registry imports them.
"""

__all__: list[str] = []
