"""Rec-Denoiser (Chen et al., RecSys 2022) on a SASRec backbone, and the shared base of
the denoising models."""

from __future__ import annotations

from recbole.utils import InputType

from recbole_freq.model.abstract_recommender import (
    TransformerRecommender,
    component_options,
    core_defaults,
    setting,
)
from recbole_freq.model.encoder import ATTENTION_OPERATORS
from recbole_freq.utils.options import whole_number

DENOISING_LOSSES = ("CE", "BPR", "BCE")


class DenoisingRecommender(TransformerRecommender):
    """Shared base: a backbone of the shared Transformer core whose training loss goes
    through ``DenoisingObjective`` (Rec-Denoiser eq. 13), so ``attention_operator:
    denoise`` masks are learned with the ARM / AR estimator and ``jacobian_gamma`` adds
    the Jacobian regulariser.  Subclasses give the backbones (``backbone`` config key ->
    token mixer) and ``training_pass``.

    Losses (``loss_type``): ``CE`` over all items, ``BPR``, or ``BCE`` with one sampled
    negative per positive (eq. 4); BPR / BCE need sampled negatives.  L2 (eq. 4's alpha)
    is RecBole's ``weight_decay``.
    """

    backbones: dict[str, str] = {}  # backbone name -> token mixer
    # Backbones that also set other settings of the core: required values (TiSASRec's
    # keys and values) and defaults where unset (SSE-PT's user part and SSE).
    backbone_settings = {
        "TiSASRec": {"time_intervals": True, "input_position_embedding": False},
    }
    backbone_defaults = {
        "SSE-PT": {"user_embedding_size": "half", "sse_user_prob": 0.92, "sse_item_prob": 0.1},
    }
    default_backbone = ""
    other_model = ""  # named in the error for another model's backbone
    other_backbones: tuple[str, ...] = ()
    loss_types = DENOISING_LOSSES
    # RecBole infers the data format from loss_type and knows CE / BPR only; BCE, like
    # BPR, takes one sampled negative per positive.  (Without sampling it is unused.)
    input_type = InputType.PAIRWISE

    def __init__(self, config, dataset):
        backbone = self._backbone(setting(config, "backbone"))
        for key, value in self.backbone_settings.get(backbone, {}).items():
            if config[key] is not None and config[key] != value:
                raise ValueError(
                    f"backbone={backbone} sets {key}={value}, and the configuration says "
                    f"{key}={config[key]}; leave {key} unset"
                )
            config[key] = value
        for key, value in self.backbone_defaults.get(backbone, {}).items():
            if config[key] is None:
                config[key] = value
        for key in self.backbone_keys():
            if config[key] is None:  # unset (~) and not the backbone's: the shared core's
                config[key] = core_defaults()[key]
        if backbone == "SSE-PT" and not config["user_embedding_size"]:
            raise ValueError(
                "backbone=SSE-PT needs user_embedding_size > 0 (its user part of the input); "
                "leave it unset for half of hidden_size"
            )
        super().__init__(config, dataset)

    @classmethod
    def backbone_keys(cls) -> set[str]:
        """The settings a backbone may decide (unset, ``~``, in the model's file)."""
        tables = (*cls.backbone_settings.values(), *cls.backbone_defaults.values())
        return {key for table in tables for key in table}

    def _backbone(self, name) -> str:
        if name in self.backbones:
            return name
        hint = ""
        if name in self.other_backbones:
            hint = f"; for a {name} backbone use --model={self.other_model}"
        raise ValueError(
            f"backbone={name!r} is unknown for {type(self).__name__}; choose from "
            f"{sorted(self.backbones)}{hint}"
        )

    def encoder_settings(self, config) -> dict:
        # Called by the base constructor: the backbone decides the token mixer.
        self.backbone = self._backbone(setting(config, "backbone"))
        self.token_mixer = self.backbones[self.backbone]
        settings = super().encoder_settings(config)
        operator = setting(config, "attention_operator")
        settings["attention_operator"] = operator
        settings["operator_options"] = component_options(config, ATTENTION_OPERATORS, operator)
        if self.token_mixer == "bsa":  # BSARec's beyond-self-attention layer, eq. 5-7
            settings.update(
                alpha=float(setting(config, "alpha")),
                c=whole_number(setting(config, "c"), "c"),
                beta_type=setting(config, "beta_type"),
                fusion_branches=("bsa",),
                fusion_weights=(1.0,),
            )
        return settings


class RecDenoiser(DenoisingRecommender):
    r"""Rec-Denoiser on a left-to-right SASRec backbone (Chen et al., RecSys 2022).

    - backbone: SASRec's embedding (eq. 1) and Transformer blocks (eq. 2-3) from the
      shared core, causal attention; ``backbone: BSARec`` uses BSARec's
      beyond-self-attention layer instead (``alpha``, ``c``, ``beta_type``), and
      ``backbone: TiSASRec`` TiSASRec's time-interval-aware attention (``time_span``;
      it sets ``time_intervals: True`` and ``input_position_embedding: False``), and
      ``backbone: SSE-PT`` SSE-PT's personalised input and score with stochastic shared
      embeddings (``user_embedding_size``, default half of ``hidden_size``;
      ``sse_user_prob`` 0.92 and ``sse_item_prob`` 0.1 unless set);
    - differentiable masks ``M = A * Z`` (eq. 5) in every attention layer: ``attention_
      operator: denoise`` (``softmax`` gives the plain backbone, e.g. for the Jacobian
      regulariser alone); ``mask_per_head``, ``mask_sampling``, ``mask_init_prob``;
    - ``estimator``: ``ARM`` (eq. 10) or ``AR`` (eq. 11); sparsity ``sparsity_beta``
      (eq. 8); Jacobian regulariser ``jacobian_gamma`` with ``jacobian_projections``
      random projections per block (eq. 12); total loss eq. 13;
    - prediction ``<F_t, T_i>`` at the last position; loss CE, BPR or BCE (eq. 4).

    Which parameters get which gradients: see ``objectives.DenoisingObjective``.  With all
    masks 1 (``Phi = +inf``) and ``sparsity_beta = jacobian_gamma = 0`` this is exactly
    SASRec (tests compare it with RecBole's SASRec on shared weights).
    """

    backbones = {
        "SASRec": "self_attention",
        "BSARec": "bsa",
        "TiSASRec": "self_attention",
        "SSE-PT": "self_attention",
    }
    default_backbone = "SASRec"
    other_model = "BERT4RecDenoiser"
    other_backbones = ("BERT4Rec",)
