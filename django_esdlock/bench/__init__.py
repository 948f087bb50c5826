"""The measuring code behind ``manage.py lock_bench``: every figure next to a baseline from the same run.

``suite.run(Options(...))`` measures, ``common.format_table`` prints,
``plot.plot`` draws (matplotlib, imported only there). Store specifics live
in ``elasticsearch`` and ``postgres`` (a :class:`kit.StoreKit` each), the
multi-process figures in ``workers``.
"""
