"""What a study's trials say: the families compared at equal budget (`comparison`), and the frames the figures
plot (`study_frames`, `trial_frames`)."""
