"""NeMo Gym v0.5 import path for run-level skills; the code lives in `nemo_gym.rollouts.skills`."""

from nemo_gym.rollouts.skills import SkillMetadata, SkillsRef, load_skill_directory, stage_skills

__all__ = ["SkillMetadata", "SkillsRef", "load_skill_directory", "stage_skills"]
