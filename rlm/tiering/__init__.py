"""The tiering engine (docs/architecture.md §1.1): the pass engine at the top — the manager
(`manager`), roles (`roles`), idle passes (`idle`), what a restart trusts (`resume`), the status
(`status`, `status_rows`, `policy_report`), a pass's result (`pass_result`) and DeleteRecords
(`delete_records`) — over its rooms by concept, each importing only the rooms below it:
`read`, then `copy` | `expire`, then `converge`, `local`, `store`.

Kept import-free so that importing one room does not load the engine."""
