"""Models: the registry (models/registry.py), the CRNN, the CTC loss. A new architecture is a module
here that registers itself with `@register_model("name")`, imported below."""
from models.crnn import CRNN, count_parameters, output_frames
from models.crnn_pytorch import CRNNPyTorch
from models.dtrb import DTRBVGG
from models.registry import ARCHITECTURES, build_model, check_model_config, model_from_config, register_model

__all__ = ["ARCHITECTURES", "CRNN", "CRNNPyTorch", "DTRBVGG", "build_model", "check_model_config", "count_parameters",
           "model_from_config", "output_frames", "register_model"]
