"""Privacy mechanisms (pure math), accounting, anonymization and transport."""
