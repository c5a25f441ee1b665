"""The study spaces shipped with lm-tuner, as package data: `tuner spaces` lists them."""
