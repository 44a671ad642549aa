"""The catalog: every table and piece of state a flow owns (:mod:`pipelines.catalog.tables`,
:mod:`pipelines.catalog.state`) and the tables' lifecycle (:mod:`pipelines.catalog.lifecycle`).

Import from the submodules: this package's ``__init__`` stays empty so that the spec models can
import :mod:`pipelines.catalog.roles` (which imports nothing of Conflux) without a cycle.
"""
