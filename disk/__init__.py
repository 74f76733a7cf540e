"""Bookie storage: journal, entry logs, index files, checkpoint, replay, cookies."""
