"""The low-communication methods after DiLoCo, each in its file: SparseLoCo, DeMo, SPARTA,
NoLoCo and an asynchronous DiLoCo (docs/strategies.md, "The frontier")."""
