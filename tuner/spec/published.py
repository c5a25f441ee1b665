"""The configurations the Mogrifier paper's tuning found best, as its reference code publishes them, and the tasks
they were tuned on (docs/methodology.md#priors). Values are copied from the files, in the reference's own names;
`tuner.spec.priors` maps them to this project's hyperparameters.

Source: deepmind/lamb at commit LAMB_COMMIT, one `config` file per study under CONFIG_FOLDER (the best trial of that
study's tuning). Every model there is lamb's capped LSTM cell, with mogrifier rounds (`feature_mask_rounds` > 0) or
without; which registered family each is, `tuner.spec.priors` asks the registry. The repository publishes no
configuration for the RLSTM or the Mogrifier RLSTM (thesis ch. 4), for an LSTM on PTB characters, or for any other
family; those get no prior.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

LAMB = "deepmind/lamb"
LAMB_COMMIT = "254a0b0e330c44e00cf535f98e9538d6e735750b"
CONFIG_FOLDER = "lamb/experiment/mogrifier/config"

Setting = bool | int | float | str


@dataclass(frozen=True)
class Task:
    """A corpus the papers tuned on, and the size of its training split (an epoch)."""

    name: str  # the registered dataset
    title: str
    level: Literal["word", "char"]
    train_tokens: int
    size_source: str


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("ptb", "PTB words", "word", 929_589, "words and <eos> of ptb.train.txt, as `tuner data check` counts them"),
    Task("wikitext-2", "WikiText-2", "word", 2_088_628, "Merity et al. (2016), Table 1"),
    Task("enwik8", "enwik8", "char", 90_000_000, "the first 90M of its 10^8 bytes (paper §3.2)"),
    Task("ptb-char", "PTB characters", "char", 5_017_483,
         "characters and <eos> of ptb.char.train.txt, as `tuner data check` counts them"),
)}
CLOSEST_BY_LEVEL = {"word": "ptb", "char": "ptb-char"}
"""The task whose configuration stands in for a corpus that is none of TASKS: the closest by level."""


@dataclass(frozen=True)
class ReferenceConfiguration:
    task: str  # a key of TASKS
    study: str  # the folder under CONFIG_FOLDER: the study and its best trial
    settings: Mapping[str, Setting]  # as the file gives them, in the reference's names

    @property
    def path(self) -> str:
        return f"{CONFIG_FOLDER}/{self.study}/config"

    @property
    def source(self) -> str:
        """Where the values are, in one line."""
        return f"{LAMB}@{LAMB_COMMIT[:12]} {self.path}"

    @property
    def parameters(self) -> int:
        return int(self.settings["num_params"])

    @property
    def training_tokens(self) -> int:
        """Tokens the reference trained on: turns x steps per turn x batch x window (it ran every turn)."""
        settings = self.settings
        return int(settings["turns"]) * int(settings["steps_per_turn"]) * int(settings["batch_size"]) * int(
            settings["max_time_steps"])

    @property
    def mogrifier(self) -> bool:
        """Whether the model has mogrifier rounds (0 rounds is the plain LSTM there)."""
        return int(self.settings["feature_mask_rounds"]) > 0

    @property
    def title(self) -> str:
        return f"{TASKS[self.task].title}, {self.parameters // 1_000_000}M {'Mogrifier' if self.mogrifier else 'LSTM'}"


_COMMON: dict[str, Setting] = {  # the same in every configuration below
    "cap_input_gate": True, "residual_connections": False, "lstm_skip_connection": True, "embedding_dropout": 0.0,
    "token_dropout": 0.0, "update_dropout": 0.0, "downprojected_output_dropout": -1.0, "optimizer_type": "rmsprop",
    "rmsprop_beta2": 0.999, "max_grad_norm": 10.0, "drop_state_probability": 0.01, "trainable_initial_state": False,
    "forget_bias": 1.0, "eval_softmax_temperature": -0.8,
}
_WORDS = {"batch_size": 64, "max_time_steps": 70, "steps_per_turn": 200, "turns": 1000,
          "trigger_averaging_turns": 50, "trigger_averaging_at_the_latest": 800}
_ENWIK8 = {"num_layers": 4, "share_input_and_output_embeddings": False, "input_embedding_ratio": 1.0,
           "mos_num_components": 0, "batch_size": 128, "max_time_steps": 500, "steps_per_turn": 400, "turns": 100,
           "trigger_averaging_turns": 10, "trigger_averaging_at_the_latest": 80}


def _configuration(task: str, study: str, **settings: Setting) -> ReferenceConfiguration:
    return ReferenceConfiguration(task, study, {**_COMMON, **settings})


REFERENCE_CONFIGURATIONS: tuple[ReferenceConfiguration, ...] = (
    _configuration(
        "ptb", "786252db3825+_tune_ptb_24m_lstm_d2_arms/trial_833", **_WORDS, num_params=24_000_000,
        num_layers=2, share_input_and_output_embeddings=True, input_embedding_ratio=1.0, mos_num_components=0,
        feature_mask_rounds=0, feature_mask_rank=0, input_dropout=0.6275626425150355,
        inter_layer_dropout=0.3069926535017156, state_dropout=0.3692225400980858, output_dropout=0.6901712653612706,
        learning_rate=0.0030369099569192135, l2_penalty=0.00024908138497223704),
    _configuration(
        "ptb", "786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483", **_WORDS, num_params=24_000_000,
        num_layers=2, share_input_and_output_embeddings=True, input_embedding_ratio=1.0, mos_num_components=0,
        feature_mask_rounds=5, feature_mask_rank=84, input_dropout=0.7290787773167251,
        inter_layer_dropout=0.2909822365241189, state_dropout=0.38729439899832296, output_dropout=0.7156690388448465,
        learning_rate=0.002299987130225388, l2_penalty=0.00025235335778471014),
    _configuration(
        "wikitext-2", "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_d2_arms/trial_763", **_WORDS,
        num_params=35_000_000, num_layers=2, share_input_and_output_embeddings=True,
        input_embedding_ratio=0.3530770457779424, mos_num_components=2, feature_mask_rounds=0, feature_mask_rank=0,
        input_dropout=0.6090979517941943, inter_layer_dropout=0.09075401405970591, state_dropout=0.2714030562283111,
        output_dropout=0.34845530389157287, learning_rate=0.003183909546336849, l2_penalty=0.00023063627783021125),
    _configuration(
        "wikitext-2", "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747", **_WORDS,
        num_params=35_000_000, num_layers=2, share_input_and_output_embeddings=True,
        input_embedding_ratio=0.1993194960596213, mos_num_components=2, feature_mask_rounds=6, feature_mask_rank=48,
        input_dropout=0.5469087645499495, inter_layer_dropout=0.1988228263748591, state_dropout=0.22137985867236876,
        output_dropout=0.34766651193735193, learning_rate=0.003287792100749033, l2_penalty=0.00018994987193751323),
    _configuration(
        "enwik8", "4d0a9a5bdb04+_tune_enwik8_48m_lstm_d4_arms/trial_400", **_ENWIK8, num_params=48_000_000,
        feature_mask_rounds=0, feature_mask_rank=0, input_dropout=0.16279440026790548,
        inter_layer_dropout=0.11949666753873665, state_dropout=0.1036809388104279,
        output_dropout=0.13860156332143037, learning_rate=0.002516709293528533, l2_penalty=2.5181258956042348e-05),
    _configuration(
        "enwik8", "4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234", **_ENWIK8,
        num_params=48_000_000, feature_mask_rounds=6, feature_mask_rank=79, input_dropout=0.015496029112930465,
        inter_layer_dropout=0.008633961431527571, state_dropout=0.0437288219541186, output_dropout=0.138307173174503,
        learning_rate=0.001021423409385794, l2_penalty=0.000993383826740019),
    _configuration(
        "enwik8", "e81db31261c0+_tune_enwik8_96m_lstm_d4_arms/trial_295", **_ENWIK8, num_params=96_000_000,
        accum_batch_size=64, feature_mask_rounds=0, feature_mask_rank=0, input_dropout=0.1233672355450206,
        inter_layer_dropout=0.12636500626697247, state_dropout=0.13063181510547955,
        output_dropout=0.24846692818769148, learning_rate=0.001975213597736287, l2_penalty=5.853555404849184e-05),
    _configuration(
        "enwik8", "e81db31261c0+_tune_enwik8_96m_lstm_fm_d4_arms_MtngW/trial_216", **_ENWIK8,
        num_params=96_000_000, accum_batch_size=64, feature_mask_rounds=5, feature_mask_rank=61,
        input_dropout=0.015908852824256536, inter_layer_dropout=0.13785990907975867, state_dropout=0.1648727901535727,
        output_dropout=0.2878539844807166, learning_rate=0.0022480107672343715, l2_penalty=4.409390792135428e-05),
    _configuration(
        "ptb-char", "0393c7dc3532+_tune_ptb_char_24m_lstm_fm_d2_asgd_ts150/trial_596",
        num_params=24_000_000, num_layers=2, share_input_and_output_embeddings=False, input_embedding_ratio=1.0,
        mos_num_components=0, feature_mask_rounds=4, feature_mask_rank=24, input_dropout=0.27860252841733274,
        inter_layer_dropout=0.0737609984911853, state_dropout=0.17118611234551975, output_dropout=0.2347428361918374,
        learning_rate=0.003739598828019367, l2_penalty=0.00025558089199237096, batch_size=64, max_time_steps=150,
        steps_per_turn=200, turns=500, trigger_averaging_turns=25, trigger_averaging_at_the_latest=400),
)
