"""Configuration: ConfigDict at the edge (experiment files, overrides), frozen dataclasses inside.

`defaults.base_config()` holds every default; `loader.load_config` reads an experiment file with
`--config.x.y=v` overrides; `validate.parse` validates it once into a typed `Config` (the
dataclasses of schema.py, the enums of enums.py)."""

from loopscale.config.defaults import base_config
from loopscale.config.loader import load_config
from loopscale.config.schema import (
    AttentionImpl,
    Config,
    DataConfig,
    DataSource,
    FFNKind,
    FlopConvention,
    GradReduction,
    GroupedMatmul,
    Injection,
    LoopDist,
    LoopModulation,
    LossLoops,
    MeshConfig,
    MLPKind,
    ModelConfig,
    MoEDispatch,
    Param,
    Remat,
    Schedule,
    TrainConfig,
)
from loopscale.config.validate import parse, parse_model

__all__ = [
    "AttentionImpl", "Config", "DataConfig", "DataSource", "FFNKind", "FlopConvention",
    "GradReduction", "GroupedMatmul", "Injection", "LoopDist", "LoopModulation", "LossLoops",
    "MeshConfig", "MLPKind", "ModelConfig", "MoEDispatch", "Param", "Remat", "Schedule",
    "TrainConfig", "base_config", "load_config", "parse", "parse_model",
]
