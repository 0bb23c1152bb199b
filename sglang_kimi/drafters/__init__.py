"""Making a drafter matched to a target, through SpecForge's formats: the target's own answers as training data
(:mod:`.regenerate`) and the draft-model config SpecForge trains from (:mod:`.draft_config`). Client tooling: it talks
to a running server and writes files; nothing here runs inside SGLang."""
