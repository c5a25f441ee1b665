"""After tuning: reruns with new seeds, the whole validation split for checkpoints tuned on a subset of it,
the test protocol on the final checkpoints, and stage 2.

Every step is idempotent: it looks at what the database already holds and does only what is
missing, so a resumed study continues where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
import ray
from optuna.trial import TrialState
from ray import tune
from sqlalchemy import select

from lm_tuner.tuner.run.budgeting import top_rung_steps
from lm_tuner.tuner.run.evaluation_jobs import (
    run_dynamic_evaluation_trial,
    run_dynamic_test,
    run_full_validation,
    run_test_protocol,
)
from lm_tuner.tuner.run.experiment import Experiment, run_experiment, run_experiments
from lm_tuner.tuner.run.registration import PARENT, SEED, DynamicEvaluationRegistrar, TrialRegistrar
from lm_tuner.tuner.run.strategies import make_sampler
from lm_tuner.tuner.run.trial import checkpoint_relative_path, corpus_digest, run_trial, training_job
from lm_tuner.tuner.settings import ArtifactRoot, Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import distributions, dynamic_evaluation_distributions, rerun_seed
from lm_tuner.tuner.store.engine import optuna_storage, sessions
from lm_tuner.tuner.store.ledger import settled_trials
from lm_tuner.tuner.store.optuna_internals import storage_trial_id
from lm_tuner.tuner.store.optuna_names import optuna_study_name
from lm_tuner.tuner.store.schema import EvaluationRecord, TrialRecord
from lm_tuner.tuner.store.trials import final_trials, top_trials

FINAL_STATES = ("COMPLETE", "PRUNED", "FAIL")


def run_reruns(spec: StudySpec, vocab_size: int, settings: Settings, callbacks: Sequence[tune.Callback]) -> None:
    """Train each family's best configurations again with `reruns.seeds` new seeds, the families' reruns in one
    Ray Tune run and proposed in turn (tuner.run.interleaving), as tuning's trials are: no slot waits for one
    family's last rerun, and a stopped study has reruns of every family rather than all of one."""
    experiments = [experiment for family in spec.families
                   if (experiment := _rerun_experiment(spec, family, vocab_size, settings)).trials > 0]
    if experiments:
        run_experiments(experiments, settings, callbacks)


def _rerun_experiment(spec: StudySpec, family: str, vocab_size: int, settings: Settings) -> Experiment:
    """The family's reruns still to run, enqueued in its Optuna reruns study (none left: `trials` is 0)."""
    url = settings.storage_url
    wanted = [(parent.trial_id, rerun_seed(spec, repeat))
              for parent in top_trials(url, spec.name, family, "tune", spec.reruns.top)
              for repeat in range(spec.reruns.seeds)]
    with sessions(url)() as session:
        settled = {(r.parent_trial_id, r.seed) for r in session.scalars(select(TrialRecord).where(
            TrialRecord.study_name == spec.name, TrialRecord.family == family, TrialRecord.stage == "rerun",
            TrialRecord.state.in_(FINAL_STATES), TrialRecord.interrupted.is_(False)))}
    optuna_name = optuna_study_name(spec.name, family, "reruns")
    storage = optuna_storage(url)
    study = optuna.create_study(study_name=optuna_name, storage=storage, direction="minimize", load_if_exists=True)
    waiting = {(t.user_attrs[PARENT], t.user_attrs[SEED])
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for parent_id, seed in wanted:
        if (parent_id, seed) not in settled | waiting:
            study.enqueue_trial(storage.get_trial(parent_id).params, user_attrs={PARENT: parent_id, SEED: seed})
    return Experiment(
        study=spec.name, family=family, optuna_name=optuna_name,
        trials=len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))),
        space=distributions(spec, family), sampler=optuna.samplers.RandomSampler(seed=spec.tuning.seed),
        trainable=run_trial, job=training_job(spec, str(settings.artifact_root)),
        registrar=TrialRegistrar(spec, family, vocab_size, url, stage="rerun",
                                 budget_steps=top_rung_steps(spec, url, family)),
        resources=_resources(spec), concurrency=spec.tuning.concurrency, max_retries=spec.tuning.max_retries,
    )


def evaluated_trials(url: str, spec: StudySpec) -> list[TrialRecord]:
    """The trials whose checkpoints are evaluated after tuning: the final ones, and each family's best tuning run."""
    reruns = spec.reruns is not None
    targets = [trial for family in spec.families for trial in final_trials(url, spec.name, family, reruns=reruns)]
    if reruns:  # the single best tuning run is reported too
        targets += [best for family in spec.families for best in top_trials(url, spec.name, family, "tune", 1)]
    return targets


def run_full_validations(spec: StudySpec, settings: Settings) -> None:
    """Where turns scored only the first `training.validation_tokens` tokens of the validation split: the
    evaluated checkpoints (`evaluated_trials`) scored on the whole split, in parallel, as each trial's
    `full_value`. Call it once tuning (and reruns, to cover their checkpoints too) is over."""
    if spec.training.validation_tokens is None:
        return
    url = settings.storage_url
    pending = [trial for trial in evaluated_trials(url, spec) if trial.val_subset and trial.full_value is None]
    task = ray.remote(run_full_validation).options(**_task_resources(spec))
    futures = {trial.trial_id: task.remote(spec.model_dump(mode="json"), corpus_digest(spec),
                                           str(_checkpoint(settings, spec, trial)), int(spec.resources.cpus_per_trial))
               for trial in pending}
    for trial_id, future in futures.items():
        loss = ray.get(future)
        with sessions(url).begin() as session:
            session.get(TrialRecord, trial_id).full_value = loss


def run_test_protocols(spec: StudySpec, settings: Settings) -> None:
    """Deterministic (and Monte-Carlo) validation and test losses of every final checkpoint, in parallel."""
    url = settings.storage_url
    targets = evaluated_trials(url, spec)
    with sessions(url)() as session:
        done = set(session.scalars(select(EvaluationRecord.trial_id).where(
            EvaluationRecord.kind == "deterministic")))
    pending = {trial.trial_id: trial for trial in targets if trial.trial_id not in done}
    if not pending:
        return
    task = ray.remote(run_test_protocol).options(**_task_resources(spec))
    futures = {trial_id: task.remote(spec.model_dump(mode="json"), corpus_digest(spec),
                                     str(_checkpoint(settings, spec, trial)), int(spec.resources.cpus_per_trial))
               for trial_id, trial in pending.items()}
    settings_used = spec.evaluation.model_dump()
    for trial_id, future in futures.items():
        result = ray.get(future)
        records = [EvaluationRecord(trial_id=trial_id, kind="deterministic", valid_loss=result["valid"],
                                    test_loss=result["test"], logit_scale=result["logit_scale"],
                                    settings=settings_used)]
        if result["mc_valid"] is not None:
            records.append(EvaluationRecord(trial_id=trial_id, kind="mc", valid_loss=result["mc_valid"],
                                            test_loss=result["mc_test"], logit_scale=result["mc_logit_scale"],
                                            settings={**settings_used, **_monte_carlo_choice(result)}))
        with sessions(url).begin() as session:
            session.add_all(records)


def _monte_carlo_choice(result: dict[str, Any]) -> dict[str, Any]:
    """What an MC record keeps besides the chosen multiplier's losses: that multiplier, and every multiplier's
    losses and logit scale (exported as `eval.mc.settings.chosen_multiplier`, `...by_multiplier.0.7.test`)."""
    by_multiplier = {str(mc["multiplier"]): {"valid": mc["valid"], "test": mc["test"], "logit_scale": mc["logit_scale"]}
                     for mc in result["mc_by_multiplier"]}
    return {"chosen_multiplier": result["mc_multiplier"], "by_multiplier": by_multiplier}


def run_stage_two(spec: StudySpec, family: str, settings: Settings, callbacks: Sequence[tune.Callback]) -> None:
    """For each of the family's best final checkpoints: a dynamic-evaluation study on validation,
    then its best settings evaluated on validation and test."""
    url = settings.storage_url
    stage = spec.dynamic_evaluation
    for parent in final_trials(url, spec.name, family, reruns=spec.reruns is not None)[:stage.top]:
        logit_scale = _evaluation(url, parent.trial_id, "deterministic").logit_scale
        checkpoint = str(_checkpoint(settings, spec, parent))
        optuna_name = optuna_study_name(spec.name, family, "dyneval", str(parent.trial_id))
        remaining = stage.trials - settled_trials(url, optuna_name)
        if remaining > 0:
            run_experiment(Experiment(
                study=spec.name, family=family, optuna_name=optuna_name, trials=remaining,
                space=dynamic_evaluation_distributions(stage),
                sampler=make_sampler(stage.sampler, spec.tuning.seed, stage.startup_trials),
                trainable=run_dynamic_evaluation_trial,
                job={"spec": spec.model_dump(mode="json"), "corpus_digest": corpus_digest(spec),
                     "checkpoint": checkpoint, "logit_scale": logit_scale},
                registrar=DynamicEvaluationRegistrar(spec.name, family, parent.trial_id, url),
                resources=_resources(spec), concurrency=spec.tuning.concurrency,
                max_retries=spec.tuning.max_retries,
            ), settings, callbacks)
        if _evaluation(url, parent.trial_id, "dynamic") is None:
            _evaluate_dynamically(spec, parent, optuna_name, checkpoint, logit_scale, url)


def _evaluate_dynamically(spec: StudySpec, parent: TrialRecord, optuna_name: str, checkpoint: str,
                          logit_scale: float, url: str) -> None:
    try:
        best = optuna.load_study(study_name=optuna_name, storage=optuna_storage(url)).best_trial
    except ValueError:  # no stage-2 trial completed: nothing to evaluate with
        return
    # Dynamic MC runs at the multiplier and logit scale the test protocol chose for MC (a record written before
    # multipliers were chosen holds the spec's single one).
    static_mc = _evaluation(url, parent.trial_id, "mc")
    monte_carlo = None if static_mc is None else (
        static_mc.settings.get("chosen_multiplier", static_mc.settings.get("mc_multiplier")), static_mc.logit_scale)
    task = ray.remote(run_dynamic_test).options(**_task_resources(spec))
    losses = ray.get(task.remote(spec.model_dump(mode="json"), corpus_digest(spec), checkpoint, best.params,
                                 logit_scale, monte_carlo, int(spec.resources.cpus_per_trial)))
    settings_used = {"dynamic_evaluation": best.params, **spec.evaluation.model_dump()}
    records = [EvaluationRecord(trial_id=parent.trial_id, kind="dynamic", valid_loss=losses["valid"],
                                test_loss=losses["test"], logit_scale=logit_scale, settings=settings_used,
                                dyneval_trial_id=storage_trial_id(best))]
    if monte_carlo is not None:
        records.append(EvaluationRecord(trial_id=parent.trial_id, kind="dynamic_mc", valid_loss=losses["mc_valid"],
                                        test_loss=losses["mc_test"], logit_scale=monte_carlo[1],
                                        settings={**settings_used, "chosen_multiplier": monte_carlo[0]},
                                        dyneval_trial_id=storage_trial_id(best)))
    with sessions(url).begin() as session:
        session.add_all(records)


def _evaluation(url: str, trial_id: int, kind: str) -> EvaluationRecord | None:
    with sessions(url)() as session:
        return session.scalar(select(EvaluationRecord).where(EvaluationRecord.trial_id == trial_id,
                                                              EvaluationRecord.kind == kind))


def _checkpoint(settings: Settings, spec: StudySpec, trial: TrialRecord) -> ArtifactRoot:
    return settings.artifact_root / checkpoint_relative_path(spec.name, trial.family, trial.number,
                                                             stage=trial.stage)


def _resources(spec: StudySpec) -> dict[str, float]:
    return {"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial}


def _task_resources(spec: StudySpec) -> dict[str, float]:
    return {"num_cpus": spec.resources.cpus_per_trial, "num_gpus": spec.resources.gpus_per_trial}
