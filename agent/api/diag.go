package api

// MaxEvidenceBytes bounds a diagnose result's evidence (DECISIONS.md §46).
const MaxEvidenceBytes = 64 << 10
