"""Security as Fluss has it: SASL/PLAIN authentication of connections on listeners that require it
(:mod:`.authenticator`), ACLs and their storage model (:mod:`.acl`), the authorizer that decides
(:mod:`.authorizer`), which operation on which resource each request needs (:mod:`.access`), and the
credentials a client sends (:mod:`.credentials`)."""
