"""Services: the business rules over the database. They flush, never commit; they raise domain errors."""
