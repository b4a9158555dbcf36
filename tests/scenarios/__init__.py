"""End-to-end scenarios: whole runs through ``bin/pipeline`` or ``Orchestrator`` with real models in real
children (crashes, kills, full disks, resumes, damaged and odd inputs). Unit tests mirror the packages
beside this folder."""
