"""notify.xa: a two-phase-commit coordinator across the broker and SQL databases.

JTA-like: register participants by name, run transactions, and let the coordinator commit
them atomically with a durable decision log (on :mod:`txlog`) and presumed abort; recovery
at start and periodically finishes what crashes left prepared.

Modules: :mod:`~notify.xa.manager` (TransactionManager), :mod:`~notify.xa.transaction`
(the 2PC driver), :mod:`~notify.xa.states` (state machine as data),
:mod:`~notify.xa.participant` (the Participant protocol), :mod:`~notify.xa.records`
(decision-log codec), :mod:`~notify.xa.decisionlog` (the log on disk),
:mod:`~notify.xa.recovery`, :mod:`~notify.xa.admin` (operator actions),
:mod:`~notify.xa.ids` (xids), :mod:`~notify.xa.errors`, and the built-in participants in
:mod:`notify.xa.resources`.
"""


from notify.protocol.keys import Xid
from notify.xa.admin import InDoubt, Resolution
from notify.xa.decisionlog import DecisionLog
from notify.xa.errors import (
    BranchHeuristicError,
    DecisionLogError,
    HeuristicCommitError,
    HeuristicError,
    HeuristicHazardError,
    HeuristicKind,
    HeuristicMixedError,
    HeuristicRollbackError,
    InDoubtError,
    LogLockedError,
    NotRegisteredError,
    OutcomeUnknownError,
    ParticipantError,
    ParticipantUnavailableError,
    RollbackError,
    TransactionTimeoutError,
    UnknownXidError,
    VoteRollbackError,
    XAError,
)
from notify.xa.ids import DEFAULT_FORMAT_ID, Scope
from notify.xa.manager import CoordinatorConfig, TransactionManager
from notify.xa.participant import Participant, ParticipantFactory, Vote
from notify.xa.records import HeuristicRecord
from notify.xa.recovery import RecoveryReport
from notify.xa.resources.broker import BrokerParticipant, BrokerProducer, SendResult
from notify.xa.resources.mysql import MySQLParticipant
from notify.xa.resources.postgres import PostgresParticipant
from notify.xa.resources.sqlalchemy import SQLAlchemyParticipant
from notify.xa.states import TxState
from notify.xa.transaction import BranchStatus, Transaction

__all__ = [
    "DEFAULT_FORMAT_ID",
    "BranchHeuristicError",
    "BranchStatus",
    "BrokerParticipant",
    "BrokerProducer",
    "CoordinatorConfig",
    "DecisionLog",
    "DecisionLogError",
    "HeuristicCommitError",
    "HeuristicError",
    "HeuristicHazardError",
    "HeuristicKind",
    "HeuristicMixedError",
    "HeuristicRecord",
    "HeuristicRollbackError",
    "InDoubt",
    "InDoubtError",
    "LogLockedError",
    "MySQLParticipant",
    "NotRegisteredError",
    "OutcomeUnknownError",
    "Participant",
    "ParticipantError",
    "ParticipantFactory",
    "ParticipantUnavailableError",
    "PostgresParticipant",
    "RecoveryReport",
    "Resolution",
    "RollbackError",
    "SQLAlchemyParticipant",
    "Scope",
    "SendResult",
    "Transaction",
    "TransactionManager",
    "TransactionTimeoutError",
    "TxState",
    "UnknownXidError",
    "Vote",
    "VoteRollbackError",
    "XAError",
    "Xid",
]
