"""The study record: everything ilge-search stores on an Optuna study or trial, typed and versioned.

The package's other modules read and write study and trial attrs only through the names re-exported here
(see :mod:`ilge_search.record.core` for the format and its versions). Each topic with its own stored
record (ensembles, portfolios, token studies ...) has a module beside ``core``; together with
:mod:`ilge_search.storage` they are the only modules that touch Optuna user attrs.
"""

from .core import *  # noqa: F403
from .core import __all__ as _core_all
from .ensemble import *  # noqa: F403
from .ensemble import __all__ as _ensemble_all
from .leaderboard import *  # noqa: F403
from .leaderboard import __all__ as _leaderboard_all
from .portfolio import *  # noqa: F403
from .portfolio import __all__ as _portfolio_all
from .source import *  # noqa: F403
from .source import __all__ as _source_all
from .timing import *  # noqa: F403
from .timing import __all__ as _timing_all
from .trial import *  # noqa: F403
from .trial import __all__ as _trial_all
from .warmstart import *  # noqa: F403
from .warmstart import __all__ as _warmstart_all
from .worker import *  # noqa: F403
from .worker import __all__ as _worker_all

__all__ = [*_core_all, *_trial_all, *_portfolio_all, *_ensemble_all, *_source_all, *_warmstart_all, *_worker_all]
__all__ += [*_leaderboard_all, *_timing_all]
