"""The ground floor: logging and the settings machinery, under every other package.

Nothing here imports anything of ours (a test walks the imports), so ``disk``,
``metadata``, the bookie and the client all stand on it. It lives inside ``ledgerd``
because the repository's top-level folders are fixed; ``ledgerd/__init__`` imports
lazily, so ``import ledgerd.base.logs`` loads no client code.
"""
