"""RL maths: advantage estimators, policy/value/KL/entropy losses, off-policy corrections and parameter
selection, as pure registered tensor functions (see README.md for the table)."""
