# What ``import bmoe`` offers, for type checkers: __init__.py loads these names on first
# use (and import-linter, which reads only .py files, sees no import of the layers here).
from bmoe.adapters.llama.context import ContextParams as ContextParams
from bmoe.domain.chat import ChatMessage as ChatMessage
from bmoe.domain.decide import DecideConfig as DecideConfig
from bmoe.domain.decide import DecideRequest as DecideRequest
from bmoe.domain.decide import DecideResult as DecideResult
from bmoe.domain.generation import GenerateRequest as GenerateRequest
from bmoe.domain.generation import Progress as Progress
from bmoe.domain.generation import RunResult as RunResult
from bmoe.domain.pieces import Piece as Piece
from bmoe.domain.sampling import SamplingParams as SamplingParams
from bmoe.domain.streaming import StreamConfig as StreamConfig
from bmoe.errors import BmoeError as BmoeError
from bmoe.errors import ChoiceCollisionError as ChoiceCollisionError
from bmoe.errors import ChoiceError as ChoiceError
from bmoe.errors import ConfigError as ConfigError
from bmoe.errors import ContextInitError as ContextInitError
from bmoe.errors import ContextOverflowError as ContextOverflowError
from bmoe.errors import DecideDisabledError as DecideDisabledError
from bmoe.errors import DecideOverflowError as DecideOverflowError
from bmoe.errors import DecideRefusedError as DecideRefusedError
from bmoe.errors import DecodeAbortedError as DecodeAbortedError
from bmoe.errors import DecodeError as DecodeError
from bmoe.errors import ExpertGraphError as ExpertGraphError
from bmoe.errors import ExpertReadError as ExpertReadError
from bmoe.errors import FixtureError as FixtureError
from bmoe.errors import GrammarError as GrammarError
from bmoe.errors import KvCacheFullError as KvCacheFullError
from bmoe.errors import ModelFetchError as ModelFetchError
from bmoe.errors import ModelFileTruncatedError as ModelFileTruncatedError
from bmoe.errors import ModelLoadError as ModelLoadError
from bmoe.errors import RequestError as RequestError
from bmoe.errors import SessionFailedError as SessionFailedError
from bmoe.errors import StreamingFaultError as StreamingFaultError
from bmoe.errors import StreamingSetupError as StreamingSetupError
from bmoe.errors import TokenizeError as TokenizeError
from bmoe.errors import ToolFormatError as ToolFormatError
from bmoe.llama_compat import Llama as Llama
from bmoe.requests.neutral import Delta as Delta
from bmoe.requests.neutral import Outcome as Outcome
from bmoe.runtime import Session as Session
from bmoe.runtime import SessionConfig as SessionConfig
from bmoe.runtime import run as run
from bmoe.tinymodel import default_model_path as default_model_path

__version__: str
__all__: list[str]
