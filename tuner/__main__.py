from lm_tuner.tuner.cli import main

main()
