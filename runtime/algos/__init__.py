"""RL maths: advantage estimators and losses as pure, registered tensor functions."""
