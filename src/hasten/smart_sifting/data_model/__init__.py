"""SageMaker smart sifting module path, served by :mod:`hasten.sifting`."""

__all__: list[str] = []
