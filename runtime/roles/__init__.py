"""Pipeline roles as Ray actors: where they are placed, the actor classes, and the driver-side groups."""
