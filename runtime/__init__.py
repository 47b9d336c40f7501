"""What runs on a Ray cluster for a job: its launcher, the pipeline driver, its roles, and the RL/SFT machinery."""
